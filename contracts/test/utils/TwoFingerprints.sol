// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {Fixture} from "./Fixture.sol";
import {IChallengeManagerTypes} from "../../src/types/ChallengeManagerTypes.sol";
import {IProtocolConfigTypes} from "../../src/types/ProtocolConfigTypes.sol";

/// @dev The fixture plus FP2, a second approved engine fingerprint (an image upgrade) that none
///      of the fixture's verifiers declares.
abstract contract TwoFingerprints is Fixture {
    bytes32 internal constant FP2 = keccak256("fingerprint 2 (new image)");

    function setUp() public virtual override {
        super.setUp();
        config.approve(IProtocolConfigTypes.Kind.EngineFingerprint, FP2);
    }

    function _status(uint256 id) internal view returns (IChallengeManagerTypes.Status) {
        return cm.challenge(id).status;
    }
}
